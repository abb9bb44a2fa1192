"""What a round is, once for every executor (`engine`), and the serial in-process executor
(`serial`: the reference semantics and the debugger's backend). The Ray executor is
`actors.ray_executor`.

May import: base, io, config, data, models, population, protocol, training, device, server.
"""

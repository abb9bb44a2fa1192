"""The server: global parameter groups, observations, selection, aggregation and planning
(`server.Server`, what the ServerActor wraps); evaluation of the global model, the headline
metrics (Acc@B, worst-case drop, tier F1) and per-device metrics from hosts' counts.

May import: base, io, config, data, models, population, protocol.
"""

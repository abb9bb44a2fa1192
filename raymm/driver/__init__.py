"""One run's life in the driver process: the loop over rounds (`loop`), what is shown meanwhile
(`progress`), checkpoints, the run directory and its pictures (`rundir`, `pictures`), early
stopping and Acc@B so far (`tracking`) and what the run reports at its end (`summary`).

May import: base, io, config, data, models, population, protocol, training, device, server, sim.
"""

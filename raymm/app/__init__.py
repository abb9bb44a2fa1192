"""The composition root: the only code that imports `policies` and `actors`. The `raymm` command
line, `raymm.run` (`api`), building a run from a scenario (`build`), whole-scenario
validation, resuming, sweeps, method variants, the bench and the generated scenario reference.

May import: base, io, config, data, models, population, protocol, training, device, server, sim,
driver, results, policies, actors.
"""

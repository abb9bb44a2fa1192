"""Reading finished runs: records and tables of runs side by side (`tables`) and learning
curves against traffic (`compare`).

May import: base, io, config, data, models, population, protocol, device, server, sim, driver.
"""

"""Reading finished runs: records and tables of runs side by side (`tables`), learning
curves against traffic (`compare`), and runs as pandas tables for notebooks (`runs`,
`raymm.load_runs`).

May import: base, io, config, data, models, population, protocol, training, device, server, sim,
driver.
"""

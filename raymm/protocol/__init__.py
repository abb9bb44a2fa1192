"""What a policy author reads: the seams (`seams`: Selector, Aggregator, Schedule, Objective),
the registry, the frozen messages that cross the server/device boundary, loss building blocks,
what devices exchange and keep (`exchange`, `device_state`), what the server observes, a
round's record, the weighted mean every linear aggregator uses (`combine`) and traffic
accounting (`traffic`); besides them, the table of lock-step reverse passes written by hand,
by objective name (`fast_paths`), which only their writers read. `policies/` imports this
package, nothing above it.

May import: base, io, config, data, models, population.
"""

"""Dataset releases, one module per release: its converter (`raymm data prepare`), its download
source (`raymm data download`) and, where a dataset reads that release alone, its loader.

A release module declares `CONVERTERS` (a tuple of `common.Converter`) and `SOURCE` (a
`common.Source`, or None where the release has no public download), and registers its loader
with `@register_dataset` if it has one of its own. The `har` and `avdigits` datasets each read
two releases, so they stay in raymm/data/har.py and avdigits.py. Adding a release is one module
and its name in `MODULES`; `raymm data list`, `prepare` and `download` read the tables below.

Shared by the modules: `common` (what a module declares; a release's files in a folder or zip),
`generic` (the layout of the multi-sensor releases, written and read), `audiovisual` (log-mel
spectrograms and frames, for `crema-d` and `ave`).

May import: base, io, data.
"""

from __future__ import annotations

from raymm.data.releases import ave, cmu_mosei, crema_d, fsdd, hapt, mnist, uci_har
from raymm.data.releases.common import Converter, Source

MODULES = (uci_har, hapt, fsdd, mnist, crema_d, ave, cmu_mosei)

#: converter name -> converter, what `raymm data prepare NAME` runs
CONVERTERS: dict[str, Converter] = {c.name: c for m in MODULES for c in m.CONVERTERS}
#: release name -> source, what `raymm data download NAME` fetches
SOURCES: dict[str, Source] = {m.SOURCE.name: m.SOURCE for m in MODULES if m.SOURCE is not None}
#: converter name -> `array_sha256` of every array of the file the shipped results were made
#: with (the converters that have one)
REFERENCE: dict[str, dict[str, str]] = {c.name: dict(c.reference) for c in CONVERTERS.values()
                                        if c.reference is not None}

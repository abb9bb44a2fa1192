"""The scenario: its typed, strict schema (`schema`), YAML read strictly (`strict_yaml`), the
numbers a scenario may ask for (`limits`), and `--set a.b=3` overrides. Whole-scenario
validation, which needs the data and the policies, is `raymm.app.validate`.

May import: base, io.
"""

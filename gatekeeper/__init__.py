"""gatekeeper: stop a language-model regression from landing.

The gate (results, compare, report, publish) imports without torch or lm-eval; only
``gatekeeper.runner`` needs them, and imports them lazily.
"""

__version__ = "0.1.0"

"""The mutation run of ``make mutate`` (mutmut): its driver and report (``run.py``) and the pytest
plugin that scopes its test runs (``scope.py``)."""

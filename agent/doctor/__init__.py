"""``llmgw doctor``: the checks a person runs by hand before trusting a node.

:mod:`agent.doctor.checks` judges (pure: a discovery report and a few facts
in, verdicts out); :mod:`agent.doctor.probe` gathers the facts discovery does
not (the PCI bus, the model dirs, the control plane). Django-free, like the
rest of the agent.
"""

"""Autoscaling of an AtomDeployment's two roles from one decision (``spec.autoscaling``).

:mod:`.policy` reads the spec, :mod:`.decision` is the decision itself: a pure function of what the pods reported,
what it decided before, the policy and the time, with no I/O, so it is tested as a function (tests/operator).
"""

"""Container images for the tests and ``make docker-build``, one job per module (:mod:`atom_localcluster.docker`)."""

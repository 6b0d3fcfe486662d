"""Sites: the places a rule looks at, each with the facts its conditions read.

base.py holds Site and the fact names of every kind; each kind has its module (norm, ops, guard, reduction,
angle, integer_float, constant, weight, pattern); facts.py and walks.py hold what several kinds share.
analysis/collect.py gathers them for a graph.
"""

"""Reusable baselines the benchmarks compare against; not part of the library.

* :mod:`benchmarks.baselines.msc`: Markovian score climbing (Naesseth, Lindsten & Blei 2020).
"""

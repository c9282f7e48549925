"""``smlens profile``: sub-millisecond SM activity of one GPU from CUPTI PM sampling.

Only :mod:`smlens.profile.cupti_session` and :mod:`smlens.profile.cuda` touch CUPTI and CUDA; the analysis
(:mod:`counters`, :mod:`recording`, :mod:`analysis`, :mod:`summary`, :mod:`report`) is pure and runs anywhere.
"""

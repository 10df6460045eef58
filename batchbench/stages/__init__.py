"""The run's stages, in the order a run takes them.

``plans`` (manifest and sampled plans) → ``target`` (start the simulator, check the
server) → ``prepare`` (tokenizer, reply accounting, calibration, the run's setup) →
``execute`` (admission and the agents, dry or live) → ``finish`` (the measured result) and
``outputs`` (the files the configuration names). Each stage is a function from a frozen
input to a frozen output; ``sequence`` composes them for one process, and ``hosting``
says how that process is treated (threads, signals, the garbage collector).

Nothing is imported here: ``batchbench merge`` reads ``execute.LiveRun`` and ``finish``
without loading the client.
"""

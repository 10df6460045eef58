"""Run options: their declaration (``declare``), value checkers (``values``), the one parser
class and options files (``parser``) and the command line of ``batchbench-agent``
(``agent``). Below ``batchbench.config``, which declares the options on ``RunConfig``'s
fields; nothing here imports the configuration or the command-line package."""

"""Run options, declared once on ``RunConfig``'s fields, and what is derived from them.

- ``declare``: the declaration (``option``, ``Flag``, ``Group``) and what it derives: the
  parsers' options, a parsed command line's field values, ``options()``, the output files.
- ``sections``: the ``--help`` sections and the commands that take the options.
- ``shape``: the 25 sampled-shape options and the shape they describe.
- ``values``: the value checkers of every command.
- ``checks``: checks that need several options or the outside world.
- ``parser``: the one parser class, and TOML options files (``--config``).
- ``agent``: the command line of ``batchbench-agent``.

Below ``batchbench.config``: nothing here imports the configuration or the command-line
package; the functions that need the configuration class take it as an argument."""

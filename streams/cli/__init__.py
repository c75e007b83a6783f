"""The `preemptctl` command line: one subcommand per capability (DESIGN §10, README).

Owns: `main` (the parser, `decide`, dispatch, exit codes), `commands` (the
other subcommands' registration), `cases` (case files for `decide`), `render`
(`--output text`). May use: every other package, the only one that may.
"""

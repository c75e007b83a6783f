"""The `preemptctl` command line: one subcommand per capability (docs/architecture.md §5, README).

Owns: `main` (the table of subcommands, lazy parsing, dispatch, exit codes,
`--version`), `decide` (the `decide` subcommand), `cases` (case files for
`decide`), `render` (`--output text`), `bench` (the benchmark group). May use:
every other package, the only one that may; each subcommand's module is
imported only when that subcommand runs.
"""

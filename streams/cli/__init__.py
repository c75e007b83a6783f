"""The `preemptctl` command line: one subcommand per capability (docs/architecture.md §5, README).

Owns: `main` (the table of subcommands, lazy parsing, dispatch, exit codes,
`--version`), `decide` (the `decide` subcommand), `cases` (case files for
`decide`), `render` (`--output text`), `bench` (the benchmark group), and each
component's subcommand: its flags, help and examples, handing over to the
component: `run` (streams.sim.run), `source` and `actuator` (also the process
around streams.kube's Source and Actuator), `worker` (streams.pipeline.app),
`replay`, `audit`, `export` and `explain` (streams.audit). May use: every other
package, the only one that may; each subcommand's module is imported only when
that subcommand runs.
"""

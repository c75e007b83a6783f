"""What every component stands on: one-line errors, the config and key files, health and metrics, progress.

Owns: `errors` (UsageError and friends: exit code 2 with one line), `options`
(`--config`, `--hmac-key-file`), `health` (/livez, /readyz, /metrics),
`progress` (a progress line on stderr). May use: engine, schemas, the standard
library and prometheus-client; nothing else in `streams`.
"""

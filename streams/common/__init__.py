"""What every component stands on: one-line errors, the config and key files, health and metrics, progress.

Owns: `errors` (UsageError and friends: exit code 2 with one line), `options`
(`--config`, `--hmac-key-file`), `health` (/livez, /readyz, /metrics),
`progress` (a progress line on stderr), `backoff` (exponential backoff with
jitter), `logs` (`--log-format`, `--log-level`, and the secret masker),
`signing` (the worker's signing key and the actuator's accepted keys). May use: engine, schemas, the standard
library and prometheus-client; nothing else in `streams`.
"""

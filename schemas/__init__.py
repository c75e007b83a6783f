"""Event contracts: the records on every topic, their orjson encoding and JSON Schema files.

Imports neither `engine` nor `streams`: downstream consumers can depend on this
package (or on the JSON Schema files beside it) alone.
"""

VERSION = 1

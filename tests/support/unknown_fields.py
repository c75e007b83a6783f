"""Objects with fields the projection (engine.projection) has never heard of, each holding a
secret-looking value, at every level it keeps: for tests/test_projection.py and
tests/test_fold_projection.py.

`SECRET`: the value; `objects_with_unknown_fields`: the hypothesis strategy, an object of a
generated cluster of any flow with unknown keys added.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from engine import projection
from tests.support import flowgen, gen

SECRET = "zq9-s3cr3t-value"

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-./", min_size=1, max_size=12)


def _inject(value: Any, spec: Any, draw: st.DrawFn) -> Any:
    """`value` with extra keys (holding the secret) at every level `spec` filters."""
    if spec is True or value is None:
        return value
    if isinstance(spec, projection._Each) and isinstance(value, list):
        return [_inject(item, spec.spec, draw) for item in value]
    if isinstance(spec, projection._Keys) and isinstance(value, dict):
        extra = draw(st.dictionaries(_names, st.just(SECRET), max_size=3))
        unknown = {
            k: v
            for k, v in extra.items()
            if k not in spec.keys and not k.startswith(spec.prefixes or ("\0",))
        }
        return {**unknown, **value}
    if isinstance(spec, dict) and isinstance(value, dict):
        out = {k: _inject(v, spec[k], draw) if k in spec else v for k, v in value.items()}
        for name in draw(st.lists(_names, max_size=3)):
            if name not in spec:
                out[name] = draw(st.sampled_from([SECRET, {"nested": SECRET}, [SECRET]]))
        return out
    return value


@st.composite
def objects_with_unknown_fields(draw: st.DrawFn) -> dict[str, Any]:
    raw = draw(st.one_of(gen.clusters(), flowgen.job_clusters(), flowgen.daemonset_clusters()))
    obj = draw(st.sampled_from(raw["objects"]))
    spec = projection.FIELDS[obj["kind"]]
    out = {k: _inject(v, spec[k], draw) if k in spec else v for k, v in obj.items()}
    out[draw(_names.filter(lambda n: n not in spec and n != "kind"))] = SECRET
    return out

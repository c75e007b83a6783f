"""preemptctl's decision engine: pure preemption logic over a cluster index.

Nothing in this package performs I/O, reads the clock, draws random numbers or
imports an asynchronous runtime; every decision is a function of the objects
and the instant it is given. `streams` wraps it with Kafka and Kubernetes.
"""

# preemptctl's one version (the package's, through pyproject.toml; the chart's appVersion and
# the image tag, held to it by tests/test_version.py), recorded in every decision
# (`engineVersion`): replaying a log with another engine version may legitimately decide
# differently. 0.2.0: PDB violations counted on the
# final victims, `node` for single-pod job preemptors, minimal ties by start time,
# explanations of three candidates and none for a fitting pod. 0.3.0: kube-scheduler parity
# (a wait only for its own preemptions, a nominated node too small is no reason to wait,
# label-less pods count against no PDB, a pod not yet scheduled is exempt from toleration),
# pending preemptors decided again when the cluster changes, decisions only for the scopes'
# schedulers, actuator outcomes folded back, bounds on input, minimal mode's new search.
# 0.4.0: the filters that read other pods (host ports, pod (anti-)affinity, topology spread),
# "not modelled" answers for volumes and resource claims, PreemptionToleration read as the
# plugin reads it, priorities outside int32 refused, gang records with memberUids.
# 0.5.0: decisions as 0.4.0's, byte for byte; the actuator's default scheduler scope, the
# source events refused for names the API server never stores, the chart's new values.
# 0.6.0: the job flow's inter-pod filters (gang members were answered "not modelled"),
# namespaceSelector read against the Namespace objects' labels.
ENGINE_VERSION = "0.6.0"

"""Plans in, engine commands and deployment files out.

Its modules, by role: :mod:`~shardlab.launch.servers` (a plan's servers, their nodes and
ports, and the shell script that starts them), :mod:`~shardlab.launch.engines` (each
engine's own command for one node), :mod:`~shardlab.launch.hardware` (what the GPUs ask:
image, device resource, multi-node NVLink), :mod:`~shardlab.launch.pods` (servers as
groups of pods), and the deployment targets built on them: :mod:`~shardlab.launch.kube`
(Kubernetes objects), :mod:`~shardlab.launch.llmd` (llm-d's model service values),
:mod:`~shardlab.launch.dynamo` (NVIDIA Dynamo's graph deployment), chosen by
:mod:`~shardlab.launch.targets`. Every container runs the command the shell target
prints for the same server. Nothing here searches: a plan is read, never changed.
"""

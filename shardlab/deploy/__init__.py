"""Deployment files of a plan where large deployments run: Kubernetes objects
(:mod:`shardlab.deploy.kube`), llm-d's model service values (:mod:`shardlab.deploy.llmd`)
and NVIDIA Dynamo's graph deployment (:mod:`shardlab.deploy.dynamo`), every container
command the one ``shardlab launch`` prints for that server (:mod:`shardlab.deploy.pods`).
"""

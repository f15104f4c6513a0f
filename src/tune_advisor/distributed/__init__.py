"""Distributed (DDP) probes through torchrun (SPEC §10).

launch.py  the torchrun command that runs the probe child on every rank; the runner starts it as the probe's
           process group
rank.py    inside each rank: the process group, the DDP wrapper with the probe's DDP knobs, the DistributedSampler,
           one stop decision for all ranks, the steps timed without gradient sync, the gather to rank 0
merge.py   one probe result from every rank's (job throughput, per-rank figures, straggler spread, communication
           share), and which rank failed first when the job failed
"""

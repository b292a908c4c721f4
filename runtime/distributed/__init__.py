"""A layer split beyond one machine: block ranges run on worker processes joined over
torch.distributed (gloo or NCCL); weights stay in each machine's own file, only
activations travel. See docs/distributed.md."""
from .cluster import Cluster, RemoteDevice
from .planned import PlannedRemote, place_remote
from .remote import RemoteRange, remote_range

__all__ = ["Cluster", "RemoteDevice", "RemoteRange", "remote_range", "PlannedRemote",
           "place_remote"]

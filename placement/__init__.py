"""Decide where every component runs and rests. Pure Python: no torch, no comfy."""
from .components import COMPONENTS, canonical_component
from .devices import Device, Inventory
from .errors import PlacementError
from .plan import ComponentPlan, DevicePlan, Plan, StreamPlan
from .resolve import plan, resolve_request
from .spec import PlacementSpec

__all__ = ["COMPONENTS", "canonical_component", "Device", "Inventory", "PlacementError",
           "ComponentPlan", "DevicePlan", "Plan", "StreamPlan", "plan", "resolve_request",
           "PlacementSpec"]

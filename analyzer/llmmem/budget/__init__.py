"""The accounting core: pure functions from (ModelSpec, TrainingSetup) to a Budget. No I/O."""

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Budget, Component, GpuTarget, Overhead, Phase, PhaseBudget, Term
from llmmem.budget.setup import SetupError, TrainingSetup

__all__ = [
    "Budget",
    "Component",
    "GpuTarget",
    "Overhead",
    "Phase",
    "PhaseBudget",
    "SetupError",
    "Term",
    "TrainingSetup",
    "estimate_budget",
]

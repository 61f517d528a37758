"""Neural-network building blocks with hard concrete gates (Sections 2.3-2.4)."""

from .gates import HardConcreteGate, gate_prior, gates_of, init_log_alpha, log_alpha_for_inclusion, pyro_gates

__all__ = ["HardConcreteGate", "gate_prior", "gates_of", "init_log_alpha", "log_alpha_for_inclusion", "pyro_gates"]

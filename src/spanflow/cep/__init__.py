"""Complex event processing in pure Python: Spark SQL conditions over events and
partial matches (:mod:`spanflow.spec.expressions`) and FlinkCEP's NFA
(:mod:`spanflow.cep.nfa`). No Spark here: :mod:`spanflow.spark` runs an NFA per key
in transformWithState."""

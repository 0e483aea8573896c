"""What spanflow keeps on JetStream besides the control log: versioned documents
(model and rule-set manifests), files (model artifacts), per-batch pins and rising
signals. Thin shells over JetStream's key-value and object stores, so that the
domain packages above (:mod:`spanflow.ml`, :mod:`spanflow.cep`) decide what a
manifest or a pin holds without ever importing a NATS client.
"""

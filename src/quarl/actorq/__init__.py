"""ActorQ: distributed actor-learner training with a full-precision learner and quantized
actors (see :mod:`quarl.actorq.system` for the loop)."""

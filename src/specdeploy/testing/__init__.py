"""What exists for tests and the sandbox only: the engine simulator (``simulator``) and the facts it checks command
lines against (``engine_facts``), sandbox hosts (``sandbox``) and realistic-size sparse checkpoints
(``fixtures``). Production code never imports this package; ``specdeploy simulate`` and ``specdeploy sandbox``
reach it lazily."""

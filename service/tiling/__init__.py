"""The tiling use case: MLIR module + hardware in, a stored decision out.

    service      TilingService.decide, its request and outcome types
    worker       the tasks a sandbox worker runs (analyse, check shapes, search and realise)
    contract     the typed models that cross the process boundary between the two
    warm_start   group records: relative group plans and their translation to a new module
    hardware     hardware by name (stored custom models, then profiles): the one resolver
    errors       PoolSaturated, TilingFailed

It may import search, measure, hardware, ir and store; nothing below it imports it. Nothing is
imported here, so a sandbox worker loading `worker` does not load the store.
"""

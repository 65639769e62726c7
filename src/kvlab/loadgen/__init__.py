"""kvlab's load generator: raw streaming client, open/closed-loop levels, pure statistics.

`client` (one keep-alive connection, raw stamps) -> `runner` (one level's schedule) ->
`record` (decode events after the level) -> `stats` (pure functions) -> `sweep` (levels,
metrics deltas, notebook rows) and `linkrun` (the seed's run-load.sh). It knows no engine
beyond the OpenAI streaming shapes.
"""

"""kvlab's load generator: raw streaming client, open/closed-loop levels, pure statistics.

`sizing` (prompts in the served model's tokens, through the engine adapter's /tokenize) ->
`client` (one keep-alive connection, raw stamps) -> `runner` (one level's schedule, by count
or by time) -> `record` (decode events after the level) -> `stats` (pure functions) and
`perrequest` (each request as a line of the level's file) -> `sweep` (warm-up, levels,
metrics deltas, notebook rows) and `linkrun` (the seed's run-load.sh). It knows no engine
beyond the OpenAI streaming shapes and what the engine adapter answers.
"""

"""kvlab's load generator: raw streaming client, open/closed-loop levels, pure statistics.

`spec` (what a sweep is asked: levels, rates, prompt sets and prefix groups, user sessions,
a trace) -> `sizing` (prompts in the served model's tokens, through the engine adapter's
/tokenize) -> `client` (one keep-alive connection, raw stamps) -> `runner` (one level's
schedule, by count, by time or at a trace's times) or `sessions` (users whose next turn waits
for the reply and a think time) -> `record` (decode events after the level) -> `stats` and
`returning` (pure functions), `rows` (the notebook row) and `perrequest` (each request as a
line of the level's file) -> `sweep` (warm-up, levels, metrics deltas) and `linkrun` (the
seed's run-load.sh); `trace` reads and rebuilds a Mooncake-format trace; `capacity` searches
the load for the highest that meets a latency target. It knows no engine beyond the OpenAI
streaming shapes and what the engine adapter answers.
"""

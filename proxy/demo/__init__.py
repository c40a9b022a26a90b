"""``tailfloor demo``: a local model, tailfloor in front of it and a short scripted
conversation showing the floor, the carry and overflow recovery, without an API key."""

"""Rollouts: how a leased prompt becomes samples. One turn (the default), or episodes with an environment."""

"""Built-in environments (generator.rollout.environment = "asyncrl.rollout.envs.<module>:<Class>")."""

"""Arena: run our bandits and peer libraries' bandits through one loop on the same losses."""

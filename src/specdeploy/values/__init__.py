"""Values every layer shares and that import nothing else of ours: findings and errors, hardware profiles, specdeploy's
own metric names and PromQL, and the one bounded HTTP request to a peer."""

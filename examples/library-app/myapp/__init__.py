"""A user's own Flower app (its model, its data) with fedhead's strategy and client step."""

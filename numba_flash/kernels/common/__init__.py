"""What every kernel family shares above the instructions: storage formats and constants."""

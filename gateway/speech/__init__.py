"""Speech out: the audio in an answer's events, measured as it reaches the client."""

"""Fakes for fault injection only: behaviour a real engine cannot be made to show on cue."""

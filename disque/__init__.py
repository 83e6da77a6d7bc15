"""Disque: a multi-master distributed job queue, wire-compatible with antirez's Disque."""

__version__ = "0.2.0"

"""Tests of ftlayer/records/."""

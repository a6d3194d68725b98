"""Tests of ftlayer/acker/."""

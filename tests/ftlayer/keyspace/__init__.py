"""Tests of ftlayer/keyspace/."""

"""kvscope.traces"""

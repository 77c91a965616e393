"""kvscope.connector"""

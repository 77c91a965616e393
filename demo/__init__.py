"""kvscope.demo"""

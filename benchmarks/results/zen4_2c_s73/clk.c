#include <stdio.h>
#include <time.h>
int main(){ struct timespec a,b; long n=2000000000; clock_gettime(CLOCK_MONOTONIC,&a);
 __asm__ volatile("mov %0, %%rcx\n1: add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n sub $4, %%rcx\n jnz 1b" :: "r"(n) : "rax","rcx");
 clock_gettime(CLOCK_MONOTONIC,&b); double s=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9; printf("%.2f GHz\n", n/s/1e9); }

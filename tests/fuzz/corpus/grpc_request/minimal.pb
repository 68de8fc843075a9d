
Hi